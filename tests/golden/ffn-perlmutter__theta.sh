REFUSED: resources.queue: site 'theta' has no queue 'gpu'; queues of theta: default, debug-cache-quad, debug-flat-quad
