from conduit_example_wire import main

main()
