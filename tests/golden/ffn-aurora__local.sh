REFUSED: jobs/ffn-aurora.yaml:24: resources.queue: site 'local' has no queues, but queue 'debug' was asked for; remove resources.queue for this site
