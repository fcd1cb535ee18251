package jobs

// A read from text offset since and event offset eventSince starts near
// its position in the log, not at the stream's start, so that a poll near
// the end of a long answer reads what it returns and a bounded remainder,
// not the whole answer (the relay's polls, Jobs.Read).
//
// The record keeps marks: after a commit whose messages took the job's
// position (its text length in UTF-16 units, plus markEventWeight per
// event) a MarkStep past the last mark, the commit adds the mark {text
// length, event count, the sequence of its last message}: the stream's
// messages after that sequence are exactly those of text offsets from
// that length and event numbers from that count on. At most maxMarks are
// kept: past them every other one is dropped and the step doubles, so the
// marks cover the whole answer evenly, the record grows by at most
// maxMarks small arrays, and a read starts at most about one step (an
// answer's length / (maxMarks/2)) before its offsets. An answer shorter
// than firstMarkStep has no mark and is read from its start, as before.
//
// Marks are written in the transaction of the messages they point after,
// so a mark never names a sequence that is not committed.
const (
	firstMarkStep   = 4096 // UTF-16 units
	maxMarks        = 32
	markEventWeight = 64 // an event counts as this many units of text
)

// mark is a position of a job's stream: [text length, event count,
// sequence of the last message before it].
type mark [3]int64

func (r *record) position() int64 { return r.Text + markEventWeight*r.Events }

// addMark records, after a commit that appended up to seq, the position
// the record's counts now say, if it is a step past the last mark.
func (r *record) addMark(seq int64) {
	if r.MarkStep == 0 {
		r.MarkStep = firstMarkStep
	}
	last := int64(0)
	if n := len(r.Marks); n > 0 {
		last = r.Marks[n-1][0] + markEventWeight*r.Marks[n-1][1]
	}
	if r.position()-last < r.MarkStep {
		return
	}
	r.Marks = append(r.Marks, mark{r.Text, r.Events, seq})
	if len(r.Marks) > maxMarks {
		kept := r.Marks[:0]
		n := len(r.Marks)
		for i, m := range r.Marks {
			if (n-1-i)%2 == 0 { // the newest stays
				kept = append(kept, m)
			}
		}
		r.Marks = kept
		r.MarkStep *= 2
	}
}

// markFor returns the sequence after which a read from since and
// eventSince may start: the last mark at or before both, or 0 for none.
func (r *record) markFor(since, eventSince int64) int64 {
	var seq int64
	for _, m := range r.Marks {
		if m[0] > since || m[1] > eventSince {
			break
		}
		seq = m[2]
	}
	return seq
}
