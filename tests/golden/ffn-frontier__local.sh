REFUSED: jobs/ffn-frontier.yaml:24: resources.queue: site 'local' has no queues, but queue 'batch' was asked for; remove resources.queue for this site
