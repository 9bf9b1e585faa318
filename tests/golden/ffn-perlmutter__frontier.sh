REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'frontier' has no queue 'gpu'; queues of frontier: batch, extended, debug
