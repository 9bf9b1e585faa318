REFUSED: jobs/ffn-local.yaml:48: resources.account: site 'theta' needs an account (allocation/project) to charge; set resources.account or the site's account
