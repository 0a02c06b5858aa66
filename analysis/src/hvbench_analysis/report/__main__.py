"""python -m hvbench_analysis.report"""

import sys

from hvbench_analysis.report.build import main

sys.exit(main())
