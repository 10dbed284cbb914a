package embedded

// SetFirstSequence makes the next session start each partition's sequence
// at seq instead of 0, to test the wrap points.
func SetFirstSequence(s *Sink, seq int32) { s.firstSeq = seq }
