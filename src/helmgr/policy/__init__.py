"""Memory policies: what sets each node's EMB:KV ratio, the HELM controller's among them."""
from helmgr.policy.policies import POLICIES, MemoryPolicy, make_policy

__all__ = ["POLICIES", "MemoryPolicy", "make_policy"]
