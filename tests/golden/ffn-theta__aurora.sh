REFUSED: resources.queue: site 'aurora' has no queue 'default'; queues of aurora: debug, debug-scaling, prod
