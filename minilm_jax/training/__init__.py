"""What every training run shares: the training loop and the checks before a run (`loop`), the
train state and optimizer (`train_state`), and metrics files (`metrics`)."""
