"""vlac from Python: a pi0.5 policy (a lerobot policy folder or a compiled .vlac package) with
lerobot's policy verbs, and `vlac serve`, lerobot's async-inference policy server.

    import vlac
    policy = vlac.Policy.from_pretrained("policy.vlac")
    action = policy.select_action(observation)   # lerobot's batch; pre/post-processing inside

See docs/python.md and docs/serve.md.
"""
from ._core import BadInputError, Error
from .policy import Policy, PolicyConfig

__version__ = "0.1.0"
__all__ = ["Policy", "PolicyConfig", "Error", "BadInputError", "__version__"]
