REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'frontier' has no queue 'default'; queues of frontier: batch, extended, debug
