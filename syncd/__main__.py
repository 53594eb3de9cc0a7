from syncd.cli import main

main()
