from conduit_core.cli import main

main()
