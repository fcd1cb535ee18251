package replaydpg

import "strings"

// render substitutes the table prefix into a query.
func render(q, prefix string) string {
	return strings.ReplaceAll(q, "%[1]s", prefix)
}
