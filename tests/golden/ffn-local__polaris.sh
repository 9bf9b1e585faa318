REFUSED: jobs/ffn-local.yaml:46: resources.account: site 'polaris' needs an account (allocation/project) to charge; set resources.account or the site's account
