REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'theta' has no queue 'gpu'; queues of theta: default, debug-cache-quad, debug-flat-quad
