# Vendored unchanged from THUDM/slime at commit 624b824 (examples/multi_agent/__init__.py); Apache License 2.0, see
# tests/e2e/slime_examples/LICENSE. Only these two lines were added. Run by tests/e2e/test_slime_examples.py.
