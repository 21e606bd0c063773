"""lexiflow: a batch NLP pipeline on Prefect.

One installed package. Its subpackages live at the top of the repository (`models/`,
`storage/`, `tasks/`, `flows/`, `deployments/`) and are mapped under `lexiflow.` by
setuptools' `package-dir` (pyproject.toml), so lexiflow never claims global names such as
`storage` that other software (a Dask worker's spill folder) also uses.

`lexiflow.loaders` (this folder) turns an artifact into its model object; it sits above
`storage/` (bytes, schemas, versions, the catalog) and `models/`.
"""
