REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'theta' has no queue 'batch'; queues of theta: default, debug-cache-quad, debug-flat-quad
