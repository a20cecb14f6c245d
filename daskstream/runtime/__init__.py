"""Where computations run: resources of the machine or cluster, schedulers."""
