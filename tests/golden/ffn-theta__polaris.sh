REFUSED: resources.queue: site 'polaris' has no queue 'default'; queues of polaris: debug, debug-scaling, prod, preemptable
