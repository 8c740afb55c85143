"""python -m easyscale_ext.cli ... = easyscale ..."""
import sys

from .main import main

sys.exit(main())
