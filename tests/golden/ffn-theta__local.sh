REFUSED: jobs/ffn-theta.yaml:25: resources.queue: site 'local' has no queues, but queue 'default' was asked for; remove resources.queue for this site
