REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'ci-cluster' has no queue 'default'; queues of ci-cluster: cluster
