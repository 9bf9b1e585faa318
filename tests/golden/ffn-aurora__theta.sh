REFUSED: jobs/ffn-aurora.yaml:24: resources.queue: site 'theta' has no queue 'debug'; queues of theta: default, debug-cache-quad, debug-flat-quad
