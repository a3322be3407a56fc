"""The only channel between rollout and training.

Life of a prompt group:  source ──get_prompt_groups──► in flight ──put_finished_groups──► ready
                                          ▲                │                               │
                                          │   put_partial_groups / stale requeue           │ get_train_groups
                                          └──────── pending ◄┘                             ▼
                                                                                         trained
Every group is in exactly one of source / pending / in flight / ready / consumed (trained or dropped),
and `state_dict` records all but the consumed ones, so a save → restore neither loses nor repeats a
prompt: groups in flight at save time come back as pending. Plain methods and picklable
arguments, so the class runs in-process or as a Ray actor (`ray.remote(DataBuffer)`) unchanged.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import pickle
from typing import Any

from lean_rl.buffer.prompt_source import PromptRecord, PromptSource, PromptSourceLike
from lean_rl.sample import Sample

Group = list[Sample]


class DataBuffer:
    def __init__(self, source: PromptSource | PromptSourceLike, n_samples_per_prompt: int,
                 max_staleness: int | None = None):
        if n_samples_per_prompt <= 0:
            raise ValueError(f"--n-samples-per-prompt must be > 0, got {n_samples_per_prompt}")
        self.source = source
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_staleness = max_staleness
        self.pending: collections.deque[Group] = collections.deque()
        # group_index -> the group as handed out: a copy, or for a new group what makes it again (_NewGroup)
        self.in_flight: dict[int, Group | _NewGroup] = {}
        self.ready: collections.deque[Group] = collections.deque()
        self.next_group_index = 0
        self.next_sample_index = 0
        self.counters: collections.Counter = collections.Counter()
        # finished groups a rollout function built itself and handed in (slime's add_samples of Samples made
        # outside the source, rollout_buffer's), to hand out again; and the metadata it keeps across calls
        self.held: collections.deque[Group] = collections.deque()
        self.held_out: set[int] = set()  # group_index of held groups handed out and not yet back
        self.user_metadata: dict[str, Any] = {}

    @property
    def _source_kind(self) -> str:
        """Which flag made the prompts (checked on resume: the two sources' states do not mix)."""
        return "--prompt-data" if isinstance(self.source, PromptSource) else "--data-source-path"

    # ------------------------------------------------------------ rollout side
    def get_prompt_groups(self, num_groups: int, max_new: int | None = None) -> list[Group]:
        """Up to `num_groups` groups to generate: resumable/requeued ones first, then at most `max_new`
        new prompts (None: no limit; fully async training admits new prompts by staleness). Fewer
        (possibly none) when the data is used up or the limit is reached."""
        groups = []
        while len(groups) < num_groups and self.pending:
            group = self.pending.popleft()
            self.in_flight[group[0].group_index] = _snapshot(group)  # as handed out, for state_dict
            groups.append(group)
        new_limit = num_groups if max_new is None else min(num_groups, len(groups) + max(max_new, 0))
        while len(groups) < new_limit:
            item = self.source.next()
            if item is None:
                break
            new = _NewGroup(*item, self.next_group_index, self.next_sample_index, self.n_samples_per_prompt)
            self.next_group_index += 1
            self.next_sample_index += new.size
            self.counters["prompts_issued"] += 1
            self.in_flight[new.group_index] = new  # made again from it if state_dict needs it: no copy
            groups.append(new.samples())
        return groups

    def put_finished_groups(self, groups: list[Group]) -> None:
        """Scored groups, ready for training."""
        for group in groups:
            self._land(group)
            self.ready.append(group)
            self.counters["groups_finished"] += 1
            self.counters["samples_finished"] += len(group)  # a trainer heal counts those it drops by it

    def put_partial_groups(self, groups: list[Group]) -> None:
        """Groups interrupted mid-generation; they are handed out again first. Samples keep their
        partial tokens (partial rollout) unless the caller reset them."""
        for group in groups:
            held = group[0].group_index in self.held_out if group else False
            self._land(group)
            if held:  # a finished group made outside the buffer, handed out and not used: held again
                self.held.appendleft(group)
                continue
            self.pending.append(group)
            self.counters["groups_partial"] += 1

    def drop_groups(self, groups: list[Group], reason: str) -> None:
        """Groups that will never be trained (e.g. removed by a dynamic-sampling filter)."""
        for group in groups:
            self._land(group)
            self.counters[f"groups_dropped_{reason}"] += 1

    def hold_finished_groups(self, groups: list[Group]) -> None:
        """Finished groups made outside the buffer: each gets a group_index and sample indices of the
        buffer's, and waits until take_held_groups hands it out (then it returns as any group does)."""
        for group in groups:
            if not group:
                raise ValueError("empty group handed to the buffer")
            group_index = self.next_group_index
            self.next_group_index += 1
            for sample in group:
                sample.group_index, sample.index = group_index, self.next_sample_index
                self.next_sample_index += 1
                sample.check()
            self.held.append(group)
            self.counters["groups_held"] += 1

    def take_held_groups(self, num_groups: int) -> list[Group]:
        groups = [self.held.popleft() for _ in range(min(num_groups, len(self.held)))]
        for group in groups:
            self.in_flight[group[0].group_index] = _snapshot(group)
            self.held_out.add(group[0].group_index)
        return groups

    def num_held(self) -> int:
        return len(self.held)

    # ------------------------------------------------------------ training side
    def get_train_groups(self, num_groups: int, policy_version: int = 0) -> list[Group]:
        """Up to `num_groups` ready groups, oldest first. With --max-staleness k, a group holding a token
        generated before version `policy_version - k` is not returned: its prompt goes back to pending,
        fresh, so it is regenerated rather than lost."""
        out = []
        while self.ready and len(out) < num_groups:
            group = self.ready.popleft()
            if self.is_stale(group, policy_version):
                self.pending.append([_reset(s) for s in group])
                self.counters["groups_requeued_stale"] += 1
                continue
            out.append(group)
            self.counters["groups_trained"] += 1
        return out

    def is_stale(self, group: Group, policy_version: int) -> bool:
        if self.max_staleness is None:
            return False
        versions = [s.oldest_version for s in group if s.oldest_version is not None]
        return bool(versions) and policy_version - min(versions) > self.max_staleness

    def num_ready(self) -> int:
        return len(self.ready)

    def num_in_flight(self) -> int:
        return len(self.in_flight)

    def num_pending(self) -> int:
        return len(self.pending)

    def get_counters(self) -> dict[str, int]:
        return dict(self.counters)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "source": self.source.state_dict(),
            "source_kind": self._source_kind,
            # in flight at save time: nothing of them reached training, so hand them out again (held
            # groups as the finished groups they are)
            "pending": [[s.to_dict() for s in g] for g in list(self.pending) + [
                _as_handed_out(g) for i, g in self.in_flight.items() if i not in self.held_out]],
            "held": [[s.to_dict() for s in g] for g in [
                _as_handed_out(g) for i, g in self.in_flight.items() if i in self.held_out] + list(self.held)],
            "user_metadata": copy.deepcopy(self.user_metadata),
            "ready": [[s.to_dict() for s in g] for g in self.ready],
            "next_group_index": self.next_group_index,
            "next_sample_index": self.next_sample_index,
            "counters": dict(self.counters),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("source_kind", "--prompt-data")  # checkpoints from before --data-source-path
        if saved != self._source_kind:
            raise ValueError(f"the checkpoint's prompts came from {saved}, this run's from {self._source_kind}: "
                             "resume with the same kind of prompt source (or start a new run)")
        self.source.load_state_dict(state["source"])
        self.pending = collections.deque([Sample.from_dict(d) for d in g] for g in state["pending"])
        self.ready = collections.deque([Sample.from_dict(d) for d in g] for g in state["ready"])
        self.in_flight = {}
        self.held = collections.deque([Sample.from_dict(d) for d in g] for g in state.get("held", []))
        self.held_out = set()
        self.user_metadata = dict(state.get("user_metadata", {}))
        self.next_group_index = state["next_group_index"]
        self.next_sample_index = state["next_sample_index"]
        self.counters = collections.Counter(state["counters"])

    # ------------------------------------------------------------ internals
    def _land(self, group: Group) -> None:
        if not group:
            raise ValueError("empty group returned to the buffer")
        key = group[0].group_index
        if any(s.group_index != key for s in group):
            raise ValueError(f"a group mixes group_index values {sorted({s.group_index for s in group})}")
        if self.in_flight.pop(key, None) is None:
            raise ValueError(f"group {key} returned to the buffer but was not handed out (or came back twice)")
        self.held_out.discard(key)
        for sample in group:
            sample.check()


def _reset(sample: Sample) -> Sample:
    sample.reset_response()
    sample.metadata.pop("reward_error", None)
    return sample



def create_data_buffer(cfg, source_factory=None) -> DataBuffer:
    """The run's buffer over --prompt-data, tokenized with the served checkpoint's tokenizer, or over
    the source that --data-source-path makes (`source_factory`: the run's loaded hook)."""
    from lean_rl.buffer.images import processor_for
    from lean_rl.buffer.prompt_source import load_prompts, load_tokenizer
    from lean_rl.buffer.user_source import make_user_source

    if cfg.data.data_source_path:
        return DataBuffer(make_user_source(cfg, source_factory), cfg.rollout.n_samples_per_prompt, cfg.rollout.max_staleness)
    if not cfg.data.prompt_data:
        raise ValueError("--prompt-data is required (or --data-source-path)")
    # a user's generate or rollout function takes a message list without --apply-chat-template as it is (slime's)
    user_generates = any(path and not path.startswith("lean_rl.") for path in (
        cfg.rollout.custom_generate_function_path, cfg.rollout.rollout_function_path))
    records, skipped = load_prompts(cfg.data.prompt_data, cfg.data, load_tokenizer(cfg.engines.model_path),
                                    user_generates=user_generates, processor=processor_for(cfg.data, cfg.engines.model_path))
    buffer = DataBuffer(PromptSource(records, cfg.data.rollout_shuffle, cfg.data.seed, cfg.data.num_epochs),
                        cfg.rollout.n_samples_per_prompt, cfg.rollout.max_staleness)
    buffer.counters.update({f"prompts_skipped_{reason}": n for reason, n in skipped.items()})
    return buffer


@dataclasses.dataclass(frozen=True)
class _NewGroup:
    """A group of `size` new samples of one prompt record: what get_prompt_groups hands out, and what the
    buffer keeps of it while it is in flight (state_dict makes the samples again from it)."""

    epoch: int
    record: PromptRecord
    group_index: int
    first_index: int
    size: int

    def samples(self) -> Group:
        return [self._sample(self.first_index + k) for k in range(self.size)]

    def _sample(self, index: int) -> Sample:
        record = self.record
        metadata = copy.deepcopy(record.metadata) if record.metadata else {}
        metadata.update(prompt_row=record.row, epoch=self.epoch)
        return Sample(index=index, group_index=self.group_index, prompt=_own(record.prompt),
                      tokens=list(record.tokens), label=_own(record.label), metadata=metadata,
                      multimodal_inputs=_own(record.multimodal_inputs))


def _own(value: Any) -> Any:
    """A copy of `value` that no other sample shares (a str, number or None is shared: it cannot change)."""
    return value if value is None or isinstance(value, (str, int, float)) else copy.deepcopy(value)


def _as_handed_out(group: Group | _NewGroup) -> Group:
    return group.samples() if isinstance(group, _NewGroup) else group


def _snapshot(group: Group) -> Group:
    """A deep copy of a group, through pickle: the samples must pickle anyway (a Ray actor's arguments,
    state_dict), and the round trip is ~7x faster than copy.deepcopy on them (19 us against 134 us for a
    group of four fresh samples), paid for every pending or held group handed out (a new group is kept in
    flight as its _NewGroup, no copy)."""
    return pickle.loads(pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL))
