REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'polaris' has no queue 'default'; queues of polaris: debug, debug-scaling, prod, small, medium, large, preemptable, capacity
