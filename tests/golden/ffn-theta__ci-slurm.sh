REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'ci-slurm' has no queue 'default'; queues of ci-slurm: debug
