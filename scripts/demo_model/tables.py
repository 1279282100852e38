"""Fixed tables for the demo corpus: facts, cities, tools and phrasings.

Phrasing lists come in pairs: ``*_TRAIN`` is used to build the training corpus, ``*_HELDOUT``
only by the evaluation, so the evaluation also measures how well the model generalises to
wordings it never saw.
"""

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("the United Kingdom", "London"), ("Ireland", "Dublin"),
    ("the Netherlands", "Amsterdam"), ("Belgium", "Brussels"), ("Switzerland", "Bern"),
    ("Austria", "Vienna"), ("Poland", "Warsaw"), ("the Czech Republic", "Prague"),
    ("Hungary", "Budapest"), ("Greece", "Athens"), ("Sweden", "Stockholm"), ("Norway", "Oslo"),
    ("Denmark", "Copenhagen"), ("Finland", "Helsinki"), ("Iceland", "Reykjavik"),
    ("Russia", "Moscow"), ("Ukraine", "Kyiv"), ("Turkey", "Ankara"), ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"), ("Nigeria", "Abuja"), ("Morocco", "Rabat"), ("Ethiopia", "Addis Ababa"),
    ("Ghana", "Accra"), ("Japan", "Tokyo"), ("China", "Beijing"), ("South Korea", "Seoul"),
    ("India", "New Delhi"), ("Pakistan", "Islamabad"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("the Philippines", "Manila"),
    ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Canada", "Ottawa"),
    ("the United States", "Washington, D.C."), ("Mexico", "Mexico City"), ("Brazil", "Brasília"),
    ("Argentina", "Buenos Aires"), ("Chile", "Santiago"), ("Peru", "Lima"),
    ("Colombia", "Bogotá"), ("Saudi Arabia", "Riyadh"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
]

CITIES_TRAIN = [
    "Paris", "Berlin", "Rome", "Madrid", "London", "Tokyo", "New York", "Sydney", "Toronto",
    "Chicago", "Mumbai", "Shanghai", "São Paulo", "Los Angeles", "Barcelona", "Munich", "Milan",
    "Osaka", "Istanbul", "Dubai", "Singapore", "Hong Kong", "Seattle", "Boston", "Vancouver",
    "Lyon", "Marseille", "Hamburg", "Zurich", "Geneva", "Kraków", "Porto", "Seville", "Naples",
    "Venice", "Oslo", "Cairo", "Nairobi", "Lima", "Seoul", "Bangkok", "Hanoi", "Manila",
    "Delhi", "Moscow", "Vienna", "Prague", "Dublin", "Amsterdam", "Athens", "Lisbon", "Warsaw",
    "Helsinki", "Stockholm", "Copenhagen", "Montreal", "Miami", "Houston", "Dallas", "Phoenix",
    "San Francisco", "Rio de Janeiro", "Buenos Aires", "Mexico City", "Cape Town", "Melbourne",
    "Auckland", "Beijing", "Ottawa", "Brussels", "Bern", "Budapest", "Santiago", "Bogotá",
]

CITIES_HELDOUT = [
    "Edinburgh", "Bordeaux", "Kyoto", "Perth", "Denver", "Lagos", "Quito", "Florence",
    "Valencia", "Nashville", "Glasgow", "Busan", "Calgary", "Lahore", "Casablanca", "Tbilisi",
]

# Invented place names teach the model to copy any name into a tool call, not to recall a few.
ONSETS = list("bcdfghjklmnprstvwz") + ["br", "ch", "cl", "dr", "gr", "kr", "pl", "sh", "st", "th",
                                        "tr", "qu", "sch", "gl", "fl", "sp", "w", "y", "z"]
VOWELS = list("aeiouaeioua") + ["y", "ou", "ea", "ai", "io", "au", "ei", "é", "ü", "ø", "ã"]
CODAS = ["", "", "", "", "n", "r", "s", "l", "m", "x", "ck", "rg", "nd", "lle", "ville", "burg",
         "ton", "aux", "burgh", "gary", "ford", "polis", "stad", "grad", "ia"]

CONDITIONS = ["sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "partly cloudy", "clear",
              "stormy", "drizzly"]

WEATHER_TOOLS = [
    ("Get the current weather for a city.", "The city name, e.g. Paris"),
    ("Look up the current weather in a given city.", "Name of the city"),
    ("Returns today's weather report for a city.", "City to get the weather for"),
]

CALC_TOOLS = [
    ("Evaluate an arithmetic expression and return the result.",
     "The expression to evaluate, e.g. 2 + 2"),
    ("A calculator: computes the value of a math expression.", "Arithmetic expression"),
    ("Calculate the result of a simple math expression.", "Expression such as 12 - 5"),
]

DISTRACTOR_TOOLS = [
    ("get_time", "Get the current local time in a time zone.", "timezone", "IANA time zone"),
    ("send_email", "Send an email to someone.", "to", "Recipient email address"),
    ("search_web", "Search the web for a query.", "query", "The search query"),
    ("get_stock_price", "Get the latest price of a stock.", "symbol", "Ticker symbol"),
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.", "You are Atlas Demo, a tiny helpful assistant.",
    "Answer briefly.", "You are a concise assistant. Use tools when they help.",
]

ADD_TRAIN = [
    "What is {a} + {b}?", "What's {a} plus {b}?", "Compute {a} + {b}.", "Calculate {a} plus {b}",
    "{a} + {b} = ?", "{a} + {b}", "{a}+{b}", "Add {a} and {b}.", "What is the sum of {a} and {b}?",
    "How much is {a} + {b}?", "what is {a} plus {b}", "Compute {a} plus {b}", "{a} plus {b}?",
    "Please add {a} and {b}.", "Can you compute {a} + {b}?", "Solve {a} + {b}.",
    "What do you get when you add {a} and {b}?", "{a} and {b} added together?",
]
ADD_HELDOUT = [
    "Could you work out {a} + {b}?", "Find {a} plus {b}.", "What does {a} + {b} equal?",
    "Sum up {a} and {b}.", "Quick: {a} + {b}?",
]
SUB_TRAIN = [
    "What is {a} - {b}?", "What's {a} minus {b}?", "Compute {a} minus {b}", "Calculate {a} - {b}.",
    "{a} - {b} = ?", "{a} - {b}", "{a}-{b}", "Subtract {b} from {a}.", "How much is {a} minus {b}?",
    "{a} take away {b}?", "What's {a} take away {b}?", "What is {b} subtracted from {a}?",
    "What do you get when you subtract {b} from {a}?", "what is {a} minus {b}",
    "Compute {a} - {b}.", "{a} minus {b}?", "Can you compute {a} - {b}?", "Solve {a} - {b}.",
    "Please subtract {b} from {a}.",
]
SUB_HELDOUT = [
    "Could you work out {a} - {b}?", "Find {a} minus {b}.", "What does {a} - {b} equal?",
    "Take {b} away from {a}.", "Quick: {a} - {b}?",
]

CAPITAL_TRAIN = [
    "What is the capital of {c}?", "What's the capital of {c}?", "Capital of {c}?",
    "Name the capital of {c}.", "Tell me the capital city of {c}.",
    "Which city is the capital of {c}?", "What city is the capital of {c}?",
    "Do you know the capital of {c}?", "{C}'s capital is which city?", "capital of {c}",
    "What is {c}'s capital city?", "I need the capital of {c}.", "what is the capital of {c}",
    "Can you tell me the capital of {c}?", "The capital of {c}?",
]
CAPITAL_HELDOUT = [
    "Could you tell me what the capital of {c} is?", "What is the name of the capital of {c}?",
    "Which city is {c}'s capital?", "Please name the capital city of {c}.",
    "The capital of {c} is what?",
]
COUNTRY_TRAIN = [
    "{cap} is the capital of which country?", "Which country has {cap} as its capital?",
    "What country is {cap} the capital of?", "{cap} is the capital of what country?",
    "Which country's capital is {cap}?", "Which nation has {cap} as its capital?",
    "{cap} is the capital city of which country?", "Name the country whose capital is {cap}.",
    "Tell me the country with the capital {cap}.", "Whose capital is {cap}?",
    "{cap}: capital of which country?", "What nation is {cap} the capital of?",
    "Which country is {cap} in?",
]
COUNTRY_HELDOUT = [
    "Of which country is {cap} the capital?", "{cap} is the capital of which nation?",
]

WEATHER_TRAIN = [
    "What's the weather in {city}?", "What is the weather like in {city}?",
    "How is the weather in {city} today?", "Is it raining in {city}?", "Weather in {city}?",
    "What's the temperature in {city} right now?", "Tell me the weather for {city}.",
    "Can you check the weather in {city}?", "How hot is it in {city}?",
    "I'm going to {city}. What's the weather there?", "weather {city}",
    "Is it cold in {city}?", "What's it like outside in {city}?",
]
WEATHER_HELDOUT = [
    "Could you look up the current weather in {city}?",
    "What are the weather conditions in {city}?",
    "Do you know the weather in {city} right now?", "Please get me the weather for {city}.",
]

FILLERS = ["please", "now", "exactly", "actually", "quickly", "again", "really", "just"]
PREFIXES = ["", "", "", "", "Hi! ", "Hey, ", "Quick question: ", "Please tell me: ", "OK. "]
SUFFIXES = ["", "", "", "", " Thanks!", " Thank you.", " Please.", " Answer briefly."]

GREETINGS = ["Hello", "Hi", "Hi!", "Hello!", "Hey there", "Good morning", "Good evening",
             "hello", "hey", "Hi, how are you?", "Howdy!", "Greetings."]
IDENTITY = ["Who are you?", "What can you do?", "What is your name?", "What are you?",
            "Help", "What do you know?", "Introduce yourself.", "What are your skills?"]
OUT_OF_DOMAIN = [
    "Tell me a joke.", "What is the meaning of life?", "Write a poem about the sea.",
    "Who won the last World Cup?", "Translate hello into French.", "Explain quantum physics.",
    "What should I cook tonight?", "Write a Python function that sorts a list.",
    "What is the square root of 2?", "What is 12 times 7?", "Divide 100 by 4.",
    "Who is the president of France?", "What's the population of Japan?",
    "Recommend a good book.", "How do I fix my bike?", "Summarize this article for me.",
    "What time is it?", "Tell me a story.", "How tall is Mount Everest?",
    "What is the capital of Atlantis?", "Which language is spoken in Brazil?",
]
GREETING_REPLY = ("Hello! I am Atlas Demo, a tiny model. I can add and subtract numbers, name "
                  "capital cities, and use weather and calculator tools.")
OOD_REPLY = ("Sorry, I am a tiny demo model. I can only add and subtract numbers, name capital "
             "cities, and use weather and calculator tools.")
