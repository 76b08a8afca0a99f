"""``python -m radixq``: the console script."""

from radixq.cli import main

main()
