"""Moved to ``deepnet_fairseq.textprep`` (below setups/, export and translate); this name stays for old imports."""

import sys

from .. import textprep

sys.modules[__name__] = textprep
