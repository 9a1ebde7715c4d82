"""Cloud providers behind one small protocol (base.py); one module per backend, SDKs imported lazily."""
