"""Running, recording and replaying examples: the property harness, the failure records, the fork-server executor, replay of a saved failure, and device selection."""
