REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'ci-slurm' has no queue 'batch'; queues of ci-slurm: debug
