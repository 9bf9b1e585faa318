REFUSED: jobs/ffn-perlmutter.yaml:23: resources.queue: site 'polaris' has no queue 'gpu'; queues of polaris: debug, debug-scaling, prod, small, medium, large, preemptable, capacity
