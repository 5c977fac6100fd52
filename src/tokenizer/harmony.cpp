#include "tokenizer/harmony.h"
