import sys
import textwrap

import pytest

from lean_rl.utils.plugins import PluginError, accepts_positional, keyword_only, load_function


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_user_pkg.py").write_text(textwrap.dedent("""
        NOT_CALLABLE = 3
        async def rm(args, sample):
            return 1.0
        def sync_rm(args, sample):
            return 1.0
        def generate_rollout(args, rollout_id, buffer, evaluation=False):
            return None
        def two_args(a, b):
            return None
        async def old_generate(cfg, sample, sampling_params):
            return sample
        async def new_generate(cfg, sample, sampling_params, evaluation=False):
            return sample
        async def slime_generate(args, sample, sampling_params, *, evaluation=False):
            return sample
        def loss(algo, *, log_probs, advantages, mask, **rest):
            return None
        class Source:
            def __init__(self, cfg):
                self.cfg = cfg
    """))
    (tmp_path / "broken_user_pkg.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_user_pkg", None)
    sys.modules.pop("broken_user_pkg", None)


def test_loads_a_valid_function(user_module):
    fn = load_function("my_user_pkg.rm", "--custom-rm-path", num_args=2, must_be_async=True)
    assert fn.__name__ == "rm"
    assert load_function("my_user_pkg.generate_rollout", "--rollout-function-path", num_args=4).__name__ == "generate_rollout"


@pytest.mark.parametrize("path, kwargs, message", [
    ("nope_pkg.rm", {}, r"--flag 'nope_pkg.rm': cannot import module 'nope_pkg'"),
    ("my_user_pkg.missing", {}, r"module 'my_user_pkg' has no attribute 'missing'"),
    ("my_user_pkg.NOT_CALLABLE", {}, r"'NOT_CALLABLE' is a int, not a function"),
    ("my_user_pkg.sync_rm", {"must_be_async": True}, r"must be an `async def` function"),
    ("my_user_pkg.rm", {"must_be_sync": True}, r"must be a plain `def` function"),
    ("my_user_pkg.two_args", {"num_args": 3}, r"must accept 3 positional argument\(s\); its signature is two_args\(a, b\)"),
    ("justaname", {}, r"expected a dotted path"),
    ("broken_user_pkg.fn", {}, r"importing 'broken_user_pkg' raised RuntimeError: boom at import"),
])
def test_errors_name_the_flag_and_the_problem(user_module, path, kwargs, message):
    kwargs = {"num_args": 2, **kwargs}
    with pytest.raises(PluginError, match=message) as info:
        load_function(path, "--flag", **kwargs)
    assert str(info.value).startswith(f"--flag {path!r}")


def test_several_argument_counts_and_keywords(user_module):
    for name in ("old_generate", "new_generate", "slime_generate"):
        assert load_function(f"my_user_pkg.{name}", "--g", num_args=(3, 4), must_be_async=True).__name__ == name
    with pytest.raises(PluginError, match=r"--g 'my_user_pkg.two_args': must accept 3 or 4 positional argument\(s\)"):
        load_function("my_user_pkg.two_args", "--g", num_args=(3, 4))
    assert load_function("my_user_pkg.loss", "--l", num_args=1, keywords=("log_probs", "advantages", "mask", "entropy"))
    with pytest.raises(PluginError, match=r"must accept 1 positional argument\(s\) and the keyword argument\(s\) "
                                          r"log_probs, weights; its signature is two_args\(a, b\)"):
        load_function("my_user_pkg.two_args", "--l", num_args=1, keywords=("log_probs", "weights"))
    assert load_function("my_user_pkg.Source", "--data-source-path", num_args=1, must_be_sync=True).__name__ == "Source"


def test_how_a_generate_function_takes_evaluation(user_module):
    import my_user_pkg

    assert accepts_positional(my_user_pkg.new_generate, 4) and not accepts_positional(my_user_pkg.old_generate, 4)
    assert not accepts_positional(my_user_pkg.slime_generate, 4) and keyword_only(my_user_pkg.slime_generate, "evaluation")
    assert not keyword_only(my_user_pkg.new_generate, "evaluation")
