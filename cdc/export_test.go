package cdc

// UseTextTuples makes s ask pgoutput for values in text format, so the
// tests cover the text decoders against a server that could send binary.
func UseTextTuples(s *Source) { s.textTuples = true }

// SpillFailures is how many sessions ended because a spill failed.
func SpillFailures(s *Source) int64 { return s.spillFailures.Load() }
