"""How scaledobject.schema.json was made (run once by hand, not by the tests):

    d=$(mktemp -d) && python3 -m pip install --target "$d" cloudcoil-models-keda==2.16.1.0
    PYTHONPATH="$d" python3 tests/data/keda/generate.py > tests/data/keda/scaledobject.schema.json
"""
import json

from cloudcoil.models.keda.v1alpha1 import ScaledObject

schema = ScaledObject.model_json_schema(by_alias=True, mode="validation")
schema["$comment"] = ("KEDA keda.sh/v1alpha1 ScaledObject, JSON Schema of cloudcoil-models-keda 2.16.1.0 "
                      "(PyPI, Apache-2.0; pydantic models generated from KEDA v2.16.1's CRDs)")
print(json.dumps(schema, indent=1, sort_keys=True))
