"""Developer scripts: the LiveKit server build, the one-command local stack (`scripts/dev`)."""
