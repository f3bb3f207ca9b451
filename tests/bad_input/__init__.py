"""Bad arguments to the public API of both layers: the exception type, and a message that
names the argument and what was expected (fuselet/spec/<op>.py words it for both layers). One
module per op family (test_<stem>.py), and test_common.py for what crosses the families;
conftest.py holds what they share."""
