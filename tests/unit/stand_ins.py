"""Stand-ins for the trainer group and the data buffer, for unit tests of the rollout and the driver
logic around them (the components themselves are tested against real Megatron / the real buffer)."""


class RefusingActor:
    """A MegatronGroup for tests of what train_on_rollout refuses before it trains: any use of it beyond
    reading its config means training went ahead."""

    role = "actor"

    def __init__(self, algo):
        self.algorithm_config = algo

    def require_training(self) -> None:
        pass

    def __getattr__(self, name):
        raise AssertionError(f"train_on_rollout used actor.{name} on a rollout it should have refused")


class RecordingBuffer:
    """The part of DataBuffer a GroupRunner calls, recording where each group went: finished, dropped
    (as (reason, group)) or back as partial."""

    def __init__(self):
        self.finished, self.dropped, self.partial = [], [], []

    def put_finished_groups(self, groups):
        self.finished += groups

    def drop_groups(self, groups, reason):
        self.dropped += [(reason, g) for g in groups]

    def put_partial_groups(self, groups):
        self.partial += groups
