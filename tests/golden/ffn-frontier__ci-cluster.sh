REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'ci-cluster' has no queue 'batch'; queues of ci-cluster: cluster
