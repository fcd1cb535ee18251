package replayd

import ()
