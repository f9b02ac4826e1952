"""What every training program shares: the training loop and the checks before a run (`loop`), the
train state and optimizer (`train_state`), program start-up and exit codes (`program`), output
directories written whole (`outputs`) and metrics files (`metrics`)."""
