package inbox

// Metrics returns c's collectors, for tests that wait on them.
func (c *Consumer) Metrics() *Metrics { return c.cfg.Metrics }
