"""The test suite: unit/ and integration/ tests, and fixtures/, what they build."""
