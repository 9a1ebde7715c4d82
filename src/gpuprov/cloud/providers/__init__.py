"""Cloud providers behind one small protocol (base.py); one module per backend, SDKs imported lazily.

A provider makes and removes machines and knows nothing of the records or SSH (import-linter's
`providers-know-no-state`): cloud/ decides, records, and asks. boto3 is imported here only (and by state/s3.py for
the team's bucket). aws.py composes aws_base.py (clients, the one error path), aws_instances.py and aws_images.py;
aws_refusals.py is the table of what each launch refusal means; aws_iam.py and aws_capacity.py make the IAM and
capacity calls. Alibaba Cloud ECS, through its own SDK: alibaba.py on alibaba_base.py (the client, the one error
path) and alibaba_images.py; alibaba_refusals.py and alibaba_catalog.py (the GPU families' documented facts).
"""
