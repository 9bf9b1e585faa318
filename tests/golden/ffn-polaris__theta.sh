REFUSED: jobs/ffn-polaris.yaml:22: resources.queue: site 'theta' has no queue 'debug'; queues of theta: default, debug-cache-quad, debug-flat-quad
