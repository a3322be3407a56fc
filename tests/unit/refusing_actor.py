"""A stand-in for a MegatronGroup, for tests of what train_on_rollout refuses before it trains: any use
of it beyond reading its config means training went ahead."""


class RefusingActor:
    role = "actor"

    def __init__(self, algo):
        self.algorithm_config = algo

    def require_training(self) -> None:
        pass

    def __getattr__(self, name):
        raise AssertionError(f"train_on_rollout used actor.{name} on a rollout it should have refused")
