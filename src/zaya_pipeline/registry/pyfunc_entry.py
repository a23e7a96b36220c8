"""The file MLflow executes to load a registered version ("models from code": nothing is unpickled).

``register`` logs this file as the pyfunc's ``python_model``; the ``zaya_pipeline`` copy logged beside it in
``code/`` provides the import.
"""

import mlflow.models

from zaya_pipeline.registry.pyfunc import ZayaGenerator

mlflow.models.set_model(ZayaGenerator())
