"""The preflight's view of a submitit job: the spec's ``model`` names the runner, which reads no model_args and no data.

``hpctrain.config.catalog`` finds this module as the schema of ``hpctrain.submitit_plugin.runner:main``
(``package.module_schema``), so a callable's job spec is checked like any other without a warning.
"""

from hpctrain.config.plugin import ModelSchema

SCHEMA = ModelSchema()
