"""What several test modules share: probes added to real runs, the CLI driver."""
