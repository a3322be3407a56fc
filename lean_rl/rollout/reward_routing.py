"""Per-sample reward routing (--reward-routes FILE): each sample goes to the rewarder its data row
names, so one run scores maths by rule, code in the sandbox, chat with the reward model and essays
with the judge, each rewarder with its own concurrency and metrics.

    field: task            # the key in the row's --metadata-key object (sample.metadata) that picks the route
    default: chat          # optional: the route of a sample whose value is missing or not listed
    routes:
      math:  {reward: math, concurrency: 16}
      code:  {reward: python_tests, concurrency: 2}
      chat:  {reward: reward_model, concurrency: 4}
      essay: {reward: judge, concurrency: 2}
      other: {reward: my_pkg.rewards.score}     # the dotted path of `async fn(cfg, sample)`

A rewarder is a --rm-type built-in, `reward_model` (--rm-hf-checkpoint), `judge` (--judge-*),
`python_tests` (the response's code with the label's tests appended, run in the sandbox of
--tool-sandbox: 1 when it exits 0) or a dotted path; all are resolved once, at start-up, into a
table of functions (RewardRouter). `concurrency` (default 8) bounds that rewarder's calls in flight.
A sample with no route fails (metadata["reward_error"]): it is never given a reward. Metrics, per
route: rollout/reward_route/<name>/samples, failed, reward_mean, seconds (route_metrics).
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lean_rl.options import ConfigError
from lean_rl.rollout.judge import JUDGE_ERROR
from lean_rl.sample import Sample, Status

if TYPE_CHECKING:
    from lean_rl.config import Config

ROUTE = "reward_route"  # metadata: the route that scored the sample
ROUTE_SECONDS = "reward_route_seconds"  # metadata: seconds in that rewarder, its queue included
ROUTE_KEYS = ("field", "default", "routes")
ENTRY_KEYS = ("reward", "concurrency")
DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True)
class RouteSpec:
    reward: str
    concurrency: int = DEFAULT_CONCURRENCY


@dataclass(frozen=True)
class RouteTable:
    field: str
    routes: dict[str, RouteSpec]
    default: str | None = None


def parse_routes(data: Any, where: str) -> RouteTable:
    """The route table of a --reward-routes file (its YAML, read); ConfigError naming the key otherwise."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with keys {', '.join(ROUTE_KEYS)}")
    unknown = sorted(set(data) - set(ROUTE_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(ROUTE_KEYS)})")
    key = data.get("field")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}: field: the metadata key that picks each sample's route (a string), got {key!r}")
    entries = data.get("routes")
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(f"{where}: routes: a mapping of field values to {{reward, concurrency}}, got {entries!r}")
    routes = {}
    for name, entry in entries.items():
        if isinstance(entry, str):
            entry = {"reward": entry}
        if not isinstance(entry, dict) or set(entry) - set(ENTRY_KEYS) or not isinstance(entry.get("reward"), str):
            raise ConfigError(f"{where}: routes: {name}: expected {{reward: NAME|DOTTED.PATH, concurrency: N}}, "
                              f"got {entry!r}")
        concurrency = entry.get("concurrency", DEFAULT_CONCURRENCY)
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigError(f"{where}: routes: {name}: concurrency must be an integer >= 1, got {concurrency!r}")
        routes[str(name)] = RouteSpec(entry["reward"], concurrency)
    default = data.get("default")
    if default is not None and str(default) not in routes:
        raise ConfigError(f"{where}: default: {default!r} is not one of the routes ({', '.join(routes)})")
    return RouteTable(key, routes, None if default is None else str(default))


def route_of(table: RouteTable, sample: Sample) -> str | None:
    """The name of the sample's route: its metadata[field] when routed, else the default (None: none)."""
    value = sample.metadata.get(table.field)
    if value is not None and str(value) in table.routes:
        return str(value)
    return table.default


def last_code_block(text: str) -> str:
    """The last ```python (or bare ```) block of `text`; the whole text when there is none."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, flags=re.DOTALL)
    return blocks[-1] if blocks else text


async def python_tests_reward(cfg: Config, sample: Sample) -> float:
    """1.0 when the response's code, with the label's tests after it, exits 0 in the sandboxed
    interpreter (rollout/sandbox.py: --tool-sandbox), else 0.0. A sandbox that cannot be built raises:
    the sample fails instead of being scored."""
    from lean_rl.rollout.sandbox import run_python

    result = await run_python(last_code_block(sample.response) + "\n\n" + str(sample.label or ""))
    return float(result.status == "ok" and result.exit_code == 0)


def resolve_rewarder(cfg: Config, spec: str, where: str) -> Callable:
    """The reward function a route names (a built-in, reward_model, judge, python_tests or a dotted path)."""
    from lean_rl.rollout.rewards import BUILTIN_REWARDS

    if spec in BUILTIN_REWARDS:
        if spec == "remote" and not cfg.reward.rm_url:
            raise ConfigError(f"{where}: remote needs --rm-url")
        return BUILTIN_REWARDS[spec]
    if spec == "reward_model":
        if cfg.reward_serving.rm_engines is None:
            raise ConfigError(f"{where}: reward_model needs --rm-hf-checkpoint DIR (the run serves it)")
        from lean_rl.rollout.reward_model import reward_model_reward

        return reward_model_reward
    if spec == "judge":
        if not cfg.reward_serving.has_judge:
            raise ConfigError(f"{where}: judge needs --judge-hf-checkpoint DIR or --judge-url URL")
        from lean_rl.rollout.judge import prepare_judge

        return prepare_judge(cfg)
    if spec == "python_tests":
        return python_tests_reward
    if "." not in spec:
        raise ConfigError(f"{where}: {spec!r} is no rewarder: one of {', '.join(sorted(BUILTIN_REWARDS))}, "
                          "reward_model, judge, python_tests, or the dotted path of async fn(cfg, sample)")
    from lean_rl.utils.plugins import load_function

    return load_function(spec, where, num_args=2, must_be_async=True)


@dataclass
class RewardRouter:
    """The reward function of a run with --reward-routes: each sample scored by its route's rewarder,
    at most that route's concurrency at a time."""

    table: RouteTable
    rewarders: dict[str, Callable]
    # one semaphore per route and event loop (a semaphore belongs to the loop that first waits on it)
    _limits: dict[tuple[int, str], asyncio.Semaphore] = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, cfg: Config) -> RewardRouter:
        from lean_rl.utils.custom_config import load_yaml_mapping

        path = cfg.reward_serving.reward_routes
        assert path is not None
        table = parse_routes(load_yaml_mapping(path, "--reward-routes"), f"--reward-routes {path}")
        return cls(table, {name: resolve_rewarder(cfg, spec.reward, f"--reward-routes {path}: routes: {name}")
                           for name, spec in table.routes.items()})

    def _limit(self, name: str) -> asyncio.Semaphore:
        key = (id(asyncio.get_running_loop()), name)
        if key not in self._limits:
            self._limits[key] = asyncio.Semaphore(self.table.routes[name].concurrency)
        return self._limits[key]

    async def __call__(self, cfg: Config, sample: Sample) -> Any:
        name = route_of(self.table, sample)
        if name is None:
            raise LookupError(f"--reward-routes: metadata[{self.table.field!r}] = "
                              f"{sample.metadata.get(self.table.field)!r} has no route and there is no default")
        sample.metadata[ROUTE] = name
        started = time.monotonic()
        try:
            async with self._limit(name):
                return await self.rewarders[name](cfg, sample)
        finally:
            sample.metadata[ROUTE_SECONDS] = time.monotonic() - started


def served_reward_function(cfg: Config) -> Callable | None:
    """The reward function when --rm-type / --custom-rm-path give none: the router (--reward-routes),
    else the one served rewarder given (config.parse_config refused a reward model and a judge
    together without routes). The judge's template and parser are resolved here, at start-up, also
    for a --custom-rm-path that calls judge.judge_score."""
    serving = getattr(cfg, "reward_serving", None)
    if serving is None:
        return None
    judge = None
    if serving.has_judge:
        from lean_rl.rollout.judge import prepare_judge

        judge = prepare_judge(cfg)
    if cfg.reward.rm_type or cfg.reward.custom_rm_path:
        return None
    if serving.reward_routes is not None:
        return RewardRouter.from_config(cfg)
    if serving.rm_engines is not None:
        from lean_rl.rollout.reward_model import reward_model_reward

        return reward_model_reward
    return judge


def route_metrics(samples: list[Sample]) -> dict[str, float]:
    """rollout/reward_route/<name>/{samples, failed, reward_mean, seconds} over the samples that were
    routed, and rollout/judge_failed: samples the judge gave no reward (when any did)."""
    by_route: dict[str, list[Sample]] = collections.defaultdict(list)
    for sample in samples:
        if isinstance(sample.metadata.get(ROUTE), str):
            by_route[sample.metadata[ROUTE]].append(sample)
    metrics: dict[str, float] = {}
    judge_failed = sum(JUDGE_ERROR in s.metadata for s in samples)
    if judge_failed:
        metrics["rollout/judge_failed"] = float(judge_failed)
    for name, routed in by_route.items():
        ok = [s.reward for s in routed if s.status != Status.FAILED and s.reward is not None]
        prefix = f"rollout/reward_route/{name}"
        metrics[f"{prefix}/samples"] = float(len(routed))
        metrics[f"{prefix}/failed"] = float(len(routed) - len(ok))
        metrics[f"{prefix}/seconds"] = float(sum(s.metadata.get(ROUTE_SECONDS, 0.0) for s in routed))
        if ok:
            metrics[f"{prefix}/reward_mean"] = sum(ok) / len(ok)
    return metrics
