"""Learning the base policy (SPEC 6): the Gymnasium environment over the simulator, PPO training."""
