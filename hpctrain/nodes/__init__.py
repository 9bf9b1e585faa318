"""Bad nodes: the check every node runs before training, which nodes train, and the blame a failure puts on a node
(read on both sides: plain standard library)."""
