REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'polaris' has no queue 'batch'; queues of polaris: debug, debug-scaling, prod, small, medium, large, preemptable, capacity
