"""Learning the base policy: the Gymnasium environment over the simulator, PPO training."""
